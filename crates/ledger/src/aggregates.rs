//! [`Aggregates`]: totals per UTC day and month by (org, caller), (org, account) and
//! (org, model) (SPEC 11), and the deltas a shared store has not taken yet.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;
use keypool_core::UnixMs;
use keypool_core::per_thread::PerThread;
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
pub fn keys_of(record: &UsageRecord) -> Vec<AggregateKey> {
    let day = Day::of(record.at);
    Dimension::ALL
        .into_iter()
        .filter_map(|dimension| Some(Group::new(dimension, record, day)?.keys()))
        .flatten()
        .collect()
}

/// The value of `dimension` in `record`, if it has one.
fn value_of(dimension: Dimension, record: &UsageRecord) -> Option<&Arc<str>> {
    match dimension {
        Dimension::Caller => Some(&record.caller.id),
        Dimension::Account => record.account.as_ref().map(|a| a.as_arc()),
        Dimension::Model => record.counted_model(),
    }
}

/// Where records are counted in one dimension: an org, the dimension's value and a
/// day (the day's aggregate and its month's), without the rest of the records.
#[derive(Debug, Clone)]
struct Group {
    dimension: Dimension,
    org: Arc<str>,
    key: Arc<str>,
    day: Day,
}

impl Group {
    fn new(dimension: Dimension, record: &UsageRecord, day: Day) -> Option<Self> {
        Some(Self {
            dimension,
            org: record.org.clone(),
            key: value_of(dimension, record)?.clone(),
            day,
        })
    }

    /// Whether `record`, of `day`, with `key` in this group's dimension, certainly
    /// belongs to this group (a `false` only costs a group of its own). The org, caller
    /// and account names are the config's own, shared by every request, so they are
    /// compared by pointer; a model is the request's own text and is also compared by
    /// value.
    fn holds(&self, record: &UsageRecord, key: &Arc<str>, day: Day) -> bool {
        self.day == day
            && Arc::ptr_eq(&self.org, &record.org)
            && (Arc::ptr_eq(&self.key, key)
                || (self.dimension == Dimension::Model && self.key == *key))
    }

    /// The group's two aggregates: its day's and its month's.
    fn keys(self) -> [AggregateKey; 2] {
        let month = AggregateKey {
            period: Period::Month(self.day.month()),
            dimension: self.dimension,
            org: self.org.clone(),
            key: self.key.clone(),
        };
        let day = AggregateKey {
            period: Period::Day(self.day),
            dimension: self.dimension,
            org: self.org,
            key: self.key,
        };
        [day, month]
    }
}

/// Records added up by group, in each dimension, not yet folded into the totals.
#[derive(Debug, Default)]
struct Queue {
    /// By [`Dimension`] (in [`Dimension::ALL`]'s order). Kept apart so that records of
    /// different accounts still share their caller's and model's groups: a pool of many
    /// accounts served in turn has a new account per record, but one caller and model.
    groups: [Vec<(Group, Totals)>; 3],
    /// Where each group of `groups` is, by its [`GroupId`]: a record finds its group in
    /// one lookup however many the queue holds, so a pool of 1,000 accounts served in
    /// turn sums each account's records in the queue, and the fold touches the totals
    /// map once per account per batch instead of twice per record.
    index: HashMap<GroupId, u32, Hasher>,
    records: usize,
}

/// A queued group's identity: its dimension, its day and its names. The org, caller and
/// account names are the config's own `Arc`s, which the group holds (so no other name
/// can take their address while it is queued), and are known by address; a model is
/// the request's own text and is known by a hash of it. Two groups with one id are
/// told apart by [`Group::holds`]; the index then points at the newer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GroupId {
    dimension: Dimension,
    day: Day,
    org: usize,
    key: u64,
}

/// Records queued before [`Aggregates::record`] folds its queue itself.
pub const FOLD_EVERY: usize = 4096;

/// Distinct groups queued before [`Aggregates::record`] folds its queue itself (what
/// bounds the queue's memory when nearly every record has groups of its own).
pub const MAX_QUEUED_GROUPS: usize = 4096;

impl Queue {
    /// Adds `record` to its group in each dimension it has: the dimension's newest
    /// group when it holds the record (a caller's and a model's usually do), else the
    /// one the index finds, else a new one.
    fn add(&mut self, record: &UsageRecord) {
        let add = Totals::of(record);
        let day = Day::of(record.at);
        self.records += 1;
        let Self { groups, index, .. } = self;
        for (groups, dimension) in groups.iter_mut().zip(Dimension::ALL) {
            let Some(key) = value_of(dimension, record) else {
                continue;
            };
            if let Some((newest, totals)) = groups.last_mut()
                && newest.holds(record, key, day)
            {
                totals.add(&add);
                continue;
            }
            let id = GroupId {
                dimension,
                day,
                org: Arc::as_ptr(&record.org).cast::<u8>() as usize,
                key: match dimension {
                    Dimension::Model => index.hasher().hash_one(&**key),
                    _ => Arc::as_ptr(key).cast::<u8>() as usize as u64,
                },
            };
            let at = u32::try_from(groups.len()).unwrap_or(u32::MAX);
            match index.entry(id) {
                Entry::Occupied(mut e) => match groups.get_mut(*e.get() as usize) {
                    Some((group, totals)) if group.holds(record, key, day) => {
                        totals.add(&add);
                        continue;
                    }
                    _ => {
                        e.insert(at);
                    }
                },
                Entry::Vacant(e) => {
                    e.insert(at);
                }
            }
            groups.extend(Group::new(dimension, record, day).map(|g| (g, add)));
        }
    }

    /// Whether [`Aggregates::record`] should fold the queue now.
    fn is_full(&self) -> bool {
        self.records >= FOLD_EVERY || self.index.len() >= MAX_QUEUED_GROUPS
    }
}

/// Totals per [`AggregateKey`]. With `track_deltas`, every addition is also kept as a
/// delta until a shared store takes it ([`Aggregates::take_deltas`]), so that a store
/// outage loses nothing: what it could not take is given back
/// ([`Aggregates::restore_deltas`]) and sent again.
///
/// The map hashes with `foldhash` (randomly seeded per map): six keys are hashed per
/// request, and SipHash was most of the ledger's cost on the request path
/// (`docs/BENCHMARKS.md`); every key is an org, key id, account id or a served model,
/// and the model keys are capped ([`MAX_MODELS`]).
#[derive(Debug, Default)]
pub struct Aggregates {
    totals: DashMap<AggregateKey, Totals, Hasher>,
    deltas: Option<Mutex<HashMap<AggregateKey, Totals, Hasher>>>,
    /// Distinct models per period (touched only when a model is new in a period).
    models: Mutex<HashMap<Period, usize>>,
    /// Records added but not yet folded into `totals`, summed by group (see
    /// [`Aggregates::record`]), one queue per serving thread.
    queued: PerThread<Queue>,
    /// Totals per (org, caller key id) since this process started, for the token and
    /// cost metrics (counters of this process): summed at the fold, so the request path
    /// pays nothing for them; never imported, exported or shared.
    since_start: Mutex<HashMap<OrgCaller, Totals, Hasher>>,
}

/// An org and a caller's key id.
type OrgCaller = (Arc<str>, Arc<str>);

type Hasher = foldhash::fast::RandomState;

/// The most distinct models one period counts; a model past it is counted under
/// [`OTHER_MODELS`], so made-up model names cannot grow the books without bound.
pub const MAX_MODELS: usize = 1_000;

/// The model key of the models past [`MAX_MODELS`].
pub const OTHER_MODELS: &str = "(other models)";

impl Aggregates {
    /// Empty aggregates; `track_deltas` for a shared store.
    pub fn new(track_deltas: bool) -> Self {
        Self {
            totals: DashMap::default(),
            deltas: track_deltas.then(|| Mutex::new(HashMap::default())),
            models: Mutex::default(),
            queued: PerThread::default(),
            since_start: Mutex::default(),
        }
    }

    /// Adds one record to its aggregates.
    ///
    /// On the request path this is a few pointer compares and at most one lookup in
    /// a small index per dimension, under the lock of this thread's queue
    /// ([`PerThread`]: no other serving thread writes it): the record is added to the
    /// totals of its group (same org, caller, account, model and day) in the queue, and
    /// the queue is folded into the maps every [`FOLD_EVERY`] records or
    /// [`MAX_QUEUED_GROUPS`] groups (every queue before anything reads the totals), so
    /// the maps are touched once per distinct group instead of six times per request,
    /// and the record itself is not kept.
    pub fn record(&self, record: &UsageRecord) {
        let full = self.queued.with(|queued| {
            queued.add(record);
            queued.is_full().then(|| std::mem::take(queued))
        });
        if let Some(mut queued) = full {
            self.add_groups(&mut queued);
            // The emptied queue goes back with its capacity (unless the slot, which
            // threads past the slot count share, has records again): a new one would
            // grow its lists and index again, each growth a copy into fresh memory.
            self.queued.with(|slot| {
                if slot.records == 0 {
                    *slot = queued;
                }
            });
        }
    }

    /// Folds every thread's queued groups into the totals (and the deltas).
    fn fold(&self) {
        let mut queues = Vec::new();
        self.queued.each(|queued| {
            if queued.records > 0 {
                queues.push(std::mem::take(queued));
            }
        });
        for mut queued in queues {
            self.add_groups(&mut queued);
        }
    }

    /// Adds a batch of records at once (what [`Aggregates::record`] does for its queue,
    /// for a caller that batches the records itself): records of the same caller,
    /// account, model and day are summed first.
    pub fn add_all<'a>(&self, records: impl IntoIterator<Item = &'a UsageRecord>) {
        let mut queue = Queue::default();
        for record in records {
            queue.add(record);
        }
        self.add_groups(&mut queue);
    }

    /// Folds `queue`'s groups into the totals (and the deltas) and empties it, keeping
    /// its capacity.
    fn add_groups(&self, queue: &mut Queue) {
        if queue.records == 0 {
            return;
        }
        queue.records = 0;
        queue.index.clear();
        // Every record has a caller: the caller groups are all the records.
        self.add_since_start(&queue.groups[0]);
        let mut deltas = self
            .deltas
            .as_ref()
            .map(|d| d.lock().unwrap_or_else(PoisonError::into_inner));
        for (group, add) in queue.groups.iter_mut().flat_map(|g| g.drain(..)) {
            // The group's names move into its day's key, then its month's: the names
            // are cloned only for an aggregate new to a map. (An `entry` with an owned
            // key would count up and down the names' shared `Arc`s twice per key, and
            // the org's is shared by every request of every thread.)
            // A model is admitted per period (MAX_MODELS), so each of its keys has its
            // own name.
            if group.dimension == Dimension::Model {
                for mut key in group.keys() {
                    if !self.totals.contains_key(&key) {
                        key = self.admit_model(key);
                    }
                    self.add_to(key, &add, deltas.as_deref_mut());
                }
                continue;
            }
            let month = Period::Month(group.day.month());
            let mut key = AggregateKey {
                period: Period::Day(group.day),
                dimension: group.dimension,
                org: group.org,
                key: group.key,
            };
            key = self.add_to(key, &add, deltas.as_deref_mut());
            key.period = month;
            self.add_to(key, &add, deltas.as_deref_mut());
        }
    }

    /// Adds `add` to `key`'s totals (and deltas); gives the key back.
    fn add_to(
        &self,
        key: AggregateKey,
        add: &Totals,
        deltas: Option<&mut HashMap<AggregateKey, Totals, Hasher>>,
    ) -> AggregateKey {
        if let Some(deltas) = deltas {
            match deltas.get_mut(&key) {
                Some(totals) => totals.add(add),
                None => {
                    deltas.insert(key.clone(), *add);
                }
            }
        }
        match self.totals.get_mut(&key) {
            Some(mut totals) => totals.add(add),
            None => self.totals.entry(key.clone()).or_default().add(add),
        }
        key
    }

    /// Adds the folded groups to the per-caller totals since start (only groups with
    /// tokens or a cost: a caller with neither has no metric row).
    fn add_since_start(&self, groups: &[(Group, Totals)]) {
        let mut since = self
            .since_start
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (group, add) in groups {
            if add.tokens() > 0 || add.cost_nano_usd > 0 {
                since
                    .entry((group.org.clone(), group.key.clone()))
                    .or_default()
                    .add(add);
            }
        }
    }

    /// Every `(org, caller key id, totals)` this process added since it started
    /// (whatever was imported), sorted: only callers whose requests had tokens or a
    /// cost.
    pub fn since_start_by_caller(&self) -> Vec<(Arc<str>, Arc<str>, Totals)> {
        self.fold();
        let since = self
            .since_start
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut rows: Vec<_> = since
            .iter()
            .map(|((org, caller), t)| (org.clone(), caller.clone(), *t))
            .collect();
        drop(since);
        rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        rows
    }

    /// A model new in its period: counted, or [`OTHER_MODELS`] past [`MAX_MODELS`].
    fn admit_model(&self, mut key: AggregateKey) -> AggregateKey {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let n = models.entry(key.period).or_default();
        if *n >= MAX_MODELS {
            key.key = Arc::from(OTHER_MODELS);
        } else {
            *n += 1;
        }
        key
    }

    /// Recounts the distinct models per period (after an import or a prune).
    fn recount_models(&self) {
        let mut counts: HashMap<Period, usize> = HashMap::new();
        for e in &self.totals {
            if e.key().dimension == Dimension::Model && &*e.key().key != OTHER_MODELS {
                *counts.entry(e.key().period).or_default() += 1;
            }
        }
        *self.models.lock().unwrap_or_else(PoisonError::into_inner) = counts;
    }

    /// The totals of `key` (zero when nothing was added).
    pub fn get(&self, key: &AggregateKey) -> Totals {
        self.fold();
        self.totals.get(key).map(|t| *t).unwrap_or_default()
    }

    /// Every `(org, key, totals)` of `period` and `dimension`, sorted by org and key.
    pub fn rows(&self, period: Period, dimension: Dimension) -> Vec<(Arc<str>, Arc<str>, Totals)> {
        self.fold();
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
        self.fold();
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
        self.fold();
        for (key, totals) in rows {
            self.totals.insert(key, totals);
        }
        self.recount_models();
    }

    /// Drops the aggregates of days and months that ended more than `keep_days` days
    /// before `now`.
    pub fn prune(&self, now: UnixMs, keep_days: u32) {
        self.fold();
        let horizon = Day::of(now).minus(keep_days).start();
        self.totals.retain(|k, _| k.period.end() > horizon);
        self.recount_models();
    }

    /// The additions no shared store has taken yet, taken now (empty without
    /// `track_deltas`).
    pub fn take_deltas(&self) -> HashMap<AggregateKey, Totals> {
        self.fold();
        self.deltas
            .as_ref()
            .map(|d| {
                std::mem::take(&mut *d.lock().unwrap_or_else(PoisonError::into_inner))
                    .into_iter()
                    .collect()
            })
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
        self.fold();
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
        self.fold();
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use keypool_core::{AccountId, Usage};

    use super::*;
    use crate::record::{CallerKind, CallerRef, CostBasis};

    const T0: UnixMs = 1_764_547_200_000;

    /// A record of `account` by one caller of one org (the config's shared names), of
    /// model `model` (its own text, as a request's is).
    fn record(org: &Arc<str>, caller: &Arc<str>, account: &AccountId, model: &str) -> UsageRecord {
        UsageRecord {
            request_id: Arc::from("r"),
            at: T0,
            org: org.clone(),
            url: Arc::from("team"),
            caller: CallerRef {
                kind: CallerKind::User,
                id: caller.clone(),
            },
            endpoint: Cow::Borrowed("messages"),
            model: Some(Arc::from(model)),
            model_sent: None,
            routing: None,
            stream: false,
            status: 200,
            account: Some(account.clone()),
            attempts: Vec::new(),
            usage: Usage {
                output_tokens: 7,
                ..Usage::default()
            },
            cost_nano_usd: 3,
            cost_basis: CostBasis::Api,
            ttft_ms: None,
            total_ms: 1,
            stream_end: None,
            limit: None,
        }
    }

    fn names(n: usize) -> (Arc<str>, Arc<str>, Vec<AccountId>) {
        let accounts = (0..n).map(|i| AccountId::from(format!("a{i}"))).collect();
        (Arc::from("acme"), Arc::from("k1"), accounts)
    }

    /// 1,000 accounts served in turn, three times over: the queue holds one group per
    /// account and one for the caller and for the model (whose text is a new `Arc` in
    /// every record), each with exactly its records.
    #[test]
    fn a_queue_sums_each_account_of_a_large_pool_in_turn() {
        let (org, caller, accounts) = names(1_000);
        let mut queue = Queue::default();
        for _ in 0..3 {
            for account in &accounts {
                queue.add(&record(&org, &caller, account, "claude"));
            }
        }
        let [callers, by_account, models] = &queue.groups;
        assert_eq!(
            (callers.len(), by_account.len(), models.len()),
            (1, 1_000, 1)
        );
        assert_eq!(queue.index.len(), 1_002);
        assert!(
            by_account
                .iter()
                .all(|(_, t)| t.requests == 3 && t.output_tokens == 21)
        );
        assert_eq!(callers[0].1.requests, 3_000);
        assert_eq!(models[0].1.cost_nano_usd, 9_000);
    }

    /// A model whose id finds another model's group in the index (a hash collision,
    /// forced here) gets a group of its own, each model is counted exactly, and the
    /// index then finds the new group.
    #[test]
    fn a_colliding_model_id_costs_a_group_not_a_wrong_count() {
        let (org, caller, accounts) = names(2);
        let mut queue = Queue::default();
        queue.add(&record(&org, &caller, &accounts[0], "opus"));
        // Every model's id now points at the "opus" group.
        let opus = *queue
            .index
            .iter()
            .find(|(id, _)| id.dimension == Dimension::Model)
            .expect("the model's group is indexed")
            .0;
        let sonnet = GroupId {
            key: queue.index.hasher().hash_one("sonnet"),
            ..opus
        };
        queue.index.insert(sonnet, 0);
        // Between the models, another account's record, so that "sonnet" is not
        // found as the newest group of its dimension.
        queue.add(&record(&org, &caller, &accounts[1], "sonnet"));
        queue.add(&record(&org, &caller, &accounts[0], "opus"));
        queue.add(&record(&org, &caller, &accounts[1], "sonnet"));
        let models: Vec<(&str, u64)> = queue.groups[2]
            .iter()
            .map(|(g, t)| (&*g.key, t.requests))
            .collect();
        assert_eq!(models, [("opus", 2), ("sonnet", 2)]);
        assert_eq!(queue.index.get(&sonnet), Some(&1));
        let aggregates = Aggregates::new(false);
        aggregates.add_groups(&mut queue);
        let rows = aggregates.rows(Period::Day(Day::of(T0)), Dimension::Model);
        let rows: Vec<(&str, u64)> = rows.iter().map(|r| (&*r.1, r.2.requests)).collect();
        assert_eq!(rows, [("opus", 2), ("sonnet", 2)]);
    }

    /// A thread's queue folds itself at [`MAX_QUEUED_GROUPS`] distinct groups, long
    /// before [`FOLD_EVERY`] records when every record brings groups of its own, and
    /// at [`FOLD_EVERY`] records however few groups they have.
    #[test]
    fn a_queue_folds_at_its_group_or_record_bound() {
        let queued = |a: &Aggregates| a.queued.with(|q| (q.records, q.index.len()));
        let (org, caller, accounts) = names(MAX_QUEUED_GROUPS);
        let aggregates = Aggregates::new(false);
        // Each record: a new account group; the caller's and model's are shared.
        for (i, account) in accounts.iter().enumerate().take(MAX_QUEUED_GROUPS - 3) {
            aggregates.record(&record(&org, &caller, account, "claude"));
            assert_eq!(queued(&aggregates), (i + 1, i + 3));
        }
        aggregates.record(&record(
            &org,
            &caller,
            &accounts[MAX_QUEUED_GROUPS - 3],
            "claude",
        ));
        assert_eq!(
            queued(&aggregates),
            (0, 0),
            "folded at {MAX_QUEUED_GROUPS} groups"
        );
        // The emptied queue is this thread's again, with the room it grew.
        let room = aggregates
            .queued
            .with(|q| (q.groups[1].capacity(), q.index.capacity()));
        assert!(
            room.0 >= MAX_QUEUED_GROUPS - 2 && room.1 >= MAX_QUEUED_GROUPS,
            "{room:?}"
        );
        assert_eq!(aggregates.totals.len(), 2 * MAX_QUEUED_GROUPS);

        let aggregates = Aggregates::new(false);
        for i in 1..FOLD_EVERY {
            aggregates.record(&record(&org, &caller, &accounts[i % 8], "claude"));
        }
        assert_eq!(queued(&aggregates), (FOLD_EVERY - 1, 10));
        assert!(aggregates.totals.is_empty());
        aggregates.record(&record(&org, &caller, &accounts[0], "claude"));
        assert_eq!(
            queued(&aggregates),
            (0, 0),
            "folded at {FOLD_EVERY} records"
        );
        let day = Period::Day(Day::of(T0));
        let total: u64 = aggregates
            .rows(day, Dimension::Account)
            .iter()
            .map(|r| r.2.requests)
            .sum();
        assert_eq!(total, FOLD_EVERY as u64);
    }
}
