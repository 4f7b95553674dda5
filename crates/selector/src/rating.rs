//! The key-rating engine (SPEC 4, "Rating").
//!
//! Per account it keeps exponentially weighted moving averages (EWMA) of TTFT, total
//! latency and error rate, plus a small ring of recent TTFT samples for the p90 that
//! sets the hedge delay. The proxy reports every attempt's outcome as a [`Sample`]; the
//! planner reads the averages to rank a group.
//!
//! Rules:
//! - [`Sample::RequestError`] (400, 404, 413, 422: the request's fault) is ignored: it
//!   counts neither as an error nor as a latency.
//! - Samples older than [`RatingConfig::max_sample_age_ms`] (10 minutes) no longer count:
//!   an average whose newest sample is older than that reads as "no sample", and the
//!   next sample starts it afresh instead of blending into the stale value.
//! - `score = w_ttft·ttft + w_total·total + w_error·error_rate` ([`RatingWeights`],
//!   defaults 1, 0.1, 10 000); lower is better.
//! - An account without a TTFT (or total) sample scores with the group's median TTFT
//!   (median total); without an error sample its error rate is 0. The *group* is the
//!   set of accounts being ranked: the survivors of the filters. The median of an even
//!   count is the mean of the two middle values.
//! - If no account of the group has a TTFT sample, every score is 0 (errors included),
//!   so the stable order keeps the snapshot order.
//!
//! The engine is thread-safe: one `RwLock` over a table of accounts; ranking takes the
//! read lock once per plan, recording takes the write lock for a few field updates.
//! Each thread remembers the rating slots of the last few snapshots it ranked (checked by
//! id pointer identity and invalidated when an account gets its first sample), so
//! ranking a cached snapshot does not hash every account id.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use keypool_core::{AccountId, UnixMs};
use serde::{Deserialize, Serialize};

use crate::candidate::Candidate;
use crate::error::SelectError;
use crate::hash::IdHasher;

/// Samples older than this (10 minutes) no longer count.
pub const DEFAULT_MAX_SAMPLE_AGE_MS: u64 = 10 * 60 * 1000;
/// How many recent TTFT samples each account keeps for its p90.
pub const RECENT_TTFT_SAMPLES: usize = 16;
/// The default EWMA factor: the weight of a new sample.
pub const DEFAULT_EWMA_ALPHA: f64 = 0.25;

/// The weights of the score formula.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatingWeights {
    /// Weight of the TTFT average, ms (default 1).
    pub ttft: f64,
    /// Weight of the total latency average, ms (default 0.1).
    pub total: f64,
    /// Weight of the error rate, 0..=1 (default 10 000: 10 % errors cost as much as a
    /// second of TTFT).
    pub error: f64,
}

impl Default for RatingWeights {
    fn default() -> Self {
        Self {
            ttft: 1.0,
            total: 0.1,
            error: 10_000.0,
        }
    }
}

impl RatingWeights {
    /// `ttft·ttft_ms + total·total_ms + error·error_rate`.
    pub fn score(&self, ttft_ms: f64, total_ms: f64, error_rate: f64) -> f64 {
        self.ttft * ttft_ms + self.total * total_ms + self.error * error_rate
    }
}

/// The rating engine's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatingConfig {
    /// The score formula's weights.
    pub weights: RatingWeights,
    /// The weight of a new sample in each average, in `(0, 1]` (default 0.25).
    pub ewma_alpha: f64,
    /// Samples older than this no longer count (default 10 minutes).
    pub max_sample_age_ms: u64,
}

impl Default for RatingConfig {
    fn default() -> Self {
        Self {
            weights: RatingWeights::default(),
            ewma_alpha: DEFAULT_EWMA_ALPHA,
            max_sample_age_ms: DEFAULT_MAX_SAMPLE_AGE_MS,
        }
    }
}

impl RatingConfig {
    /// Checks that the weights are finite and non-negative and the EWMA factor is in
    /// `(0, 1]`.
    pub fn validate(&self) -> Result<(), SelectError> {
        let w = self.weights;
        for (value, what) in [
            (w.ttft, "the TTFT weight"),
            (w.total, "the total latency weight"),
            (w.error, "the error weight"),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(SelectError::InvalidRatingConfig(what));
            }
        }
        if !(self.ewma_alpha > 0.0 && self.ewma_alpha <= 1.0) {
            return Err(SelectError::InvalidRatingConfig("the EWMA factor"));
        }
        Ok(())
    }
}

/// The outcome of one attempt, as the rating engine counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    /// The attempt succeeded: TTFT (ms to the first valid frame, or to the response
    /// headers when not streaming) and total latency (ms).
    Success {
        /// Time to first token, ms.
        ttft_ms: u64,
        /// Total latency, ms.
        total_ms: u64,
    },
    /// The attempt failed for a reason that is the account's (or upstream's): 429,
    /// 5xx, 401/403/402, timeout, connection error, no valid first frame. Counts as an
    /// error (1) in the error rate. An attempt aborted because its partner won a
    /// hedge/race is not a failure: report nothing for it.
    Failure,
    /// The request's own fault (400, 404, 413, 422): not recorded at all.
    RequestError,
}

/// What the engine knows about one account now; `None` where it has no fresh sample.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AccountRating {
    /// TTFT average, ms.
    pub ttft_ms: Option<f64>,
    /// Total latency average, ms.
    pub total_ms: Option<f64>,
    /// Error rate average, 0..=1.
    pub error_rate: Option<f64>,
}

/// One exported average.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EwmaState {
    /// The average.
    pub value: f64,
    /// When its newest sample was taken (unix ms).
    pub updated_at: UnixMs,
}

/// One exported TTFT sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtftSample {
    /// When it was taken (unix ms).
    pub at: UnixMs,
    /// TTFT, ms.
    pub ttft_ms: u32,
}

/// The exported rating state of one account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountRatingState {
    /// The account.
    pub id: AccountId,
    /// TTFT average.
    pub ttft: Option<EwmaState>,
    /// Total latency average.
    pub total: Option<EwmaState>,
    /// Error rate average.
    pub error: Option<EwmaState>,
    /// Recent TTFT samples, oldest first (at most [`RECENT_TTFT_SAMPLES`]).
    pub recent_ttft: Vec<TtftSample>,
}

/// The exported rating state of every account: what the store mirrors (best-effort)
/// to Redis or a state file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RatingState {
    /// One entry per account with at least one fresh sample.
    pub accounts: Vec<AccountRatingState>,
}

/// `at` of an average that never had a sample.
const NEVER: UnixMs = UnixMs::MAX;

/// One moving average: 16 bytes, so that ranking reads few cache lines.
#[derive(Debug, Clone, Copy)]
struct Ewma {
    value: f64,
    /// When the newest sample was taken; [`NEVER`] when there was none.
    at: UnixMs,
}

impl Default for Ewma {
    fn default() -> Self {
        Self {
            value: 0.0,
            at: NEVER,
        }
    }
}

impl Ewma {
    fn is_fresh(&self, now: UnixMs, max_age: u64) -> bool {
        self.at != NEVER && now.saturating_sub(self.at) <= max_age
    }

    fn get(&self, now: UnixMs, max_age: u64) -> Option<f64> {
        self.is_fresh(now, max_age).then_some(self.value)
    }

    fn observe(&mut self, x: f64, now: UnixMs, alpha: f64, max_age: u64) {
        self.value = if self.is_fresh(now, max_age) {
            alpha * x + (1.0 - alpha) * self.value
        } else {
            x
        };
        self.at = if self.at == NEVER {
            now
        } else {
            self.at.max(now)
        };
    }

    fn export(&self, now: UnixMs, max_age: u64) -> Option<EwmaState> {
        self.is_fresh(now, max_age).then_some(EwmaState {
            value: self.value,
            updated_at: self.at,
        })
    }

    /// Takes `other` when it is newer and sane.
    fn merge(&mut self, other: Option<EwmaState>) {
        let Some(o) = other else { return };
        let sane = o.value.is_finite() && o.value >= 0.0 && o.updated_at != NEVER;
        if sane && (self.at == NEVER || o.updated_at > self.at) {
            *self = Ewma {
                // `+ 0.0` turns -0.0 into 0.0: ranking orders values by their bits.
                value: o.value + 0.0,
                at: o.updated_at,
            };
        }
    }
}

/// The samples of one account's ring of recent TTFTs, in slot order (its [`Cursor`]
/// says where it starts).
type Samples = [TtftSample; RECENT_TTFT_SAMPLES];

/// Where an account's ring of recent TTFTs stands: kept apart from its samples, in a
/// dense array of two bytes per account. A sample's record then touches the one line
/// the new sample goes in, not also the line the ring's cursor would share with its
/// last samples: in a pool of 1,000 accounts served in turn both are cache misses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cursor {
    /// Samples held.
    len: u8,
    /// The slot the next sample goes in.
    next: u8,
}

const _: () = assert!(RECENT_TTFT_SAMPLES <= u8::MAX as usize);

/// A ring of the most recent TTFT samples: its samples and its cursor.
#[derive(Debug, Clone, Copy)]
struct RecentTtft<'t> {
    samples: &'t Samples,
    cursor: Cursor,
}

/// [`RecentTtft`], to add samples to.
struct RecentTtftMut<'t> {
    samples: &'t mut Samples,
    cursor: &'t mut Cursor,
}

impl RecentTtftMut<'_> {
    fn push(&mut self, sample: TtftSample) {
        let next = usize::from(self.cursor.next) % RECENT_TTFT_SAMPLES;
        self.samples[next] = sample;
        // Both stay below RECENT_TTFT_SAMPLES (asserted ≤ u8::MAX above).
        self.cursor.next = ((next + 1) % RECENT_TTFT_SAMPLES) as u8;
        self.cursor.len = (usize::from(self.cursor.len) + 1).min(RECENT_TTFT_SAMPLES) as u8;
    }

    fn as_ref(&self) -> RecentTtft<'_> {
        RecentTtft {
            samples: self.samples,
            cursor: *self.cursor,
        }
    }

    /// Replaces the ring with the newest [`RECENT_TTFT_SAMPLES`] of `samples` (oldest
    /// first).
    fn replace(&mut self, samples: &[TtftSample]) {
        *self.cursor = Cursor::default();
        let skip = samples.len().saturating_sub(RECENT_TTFT_SAMPLES);
        for &s in &samples[skip..] {
            self.push(s);
        }
    }
}

impl<'t> RecentTtft<'t> {
    /// Oldest first.
    fn iter(self) -> impl Iterator<Item = TtftSample> + 't {
        let (len, next) = (usize::from(self.cursor.len), usize::from(self.cursor.next));
        let start = (next + RECENT_TTFT_SAMPLES - len) % RECENT_TTFT_SAMPLES;
        let samples = self.samples;
        (0..len).map(move |i| samples[(start + i) % RECENT_TTFT_SAMPLES])
    }

    fn newest_at(self) -> Option<UnixMs> {
        self.iter().map(|s| s.at).max()
    }

    /// Nearest-rank p90 of the fresh samples.
    fn p90(self, now: UnixMs, max_age: u64) -> Option<u64> {
        let mut fresh = [0u32; RECENT_TTFT_SAMPLES];
        let mut n = 0;
        for s in self.iter().filter(|s| now.saturating_sub(s.at) <= max_age) {
            fresh[n] = s.ttft_ms;
            n += 1;
        }
        if n == 0 {
            return None;
        }
        let fresh = &mut fresh[..n];
        fresh.sort_unstable();
        // Nearest rank: ceil(0.9·n), 1-based.
        let rank = (9 * n).div_ceil(10);
        Some(u64::from(fresh[rank - 1]))
    }
}

/// The three averages of one account (48 bytes; the TTFT ring lives apart, it is read
/// only for the p90 of the hedge delay).
#[derive(Debug, Clone, Copy, Default)]
struct Averages {
    ttft: Ewma,
    total: Ewma,
    error: Ewma,
}

/// No slot: the account has never had a sample.
const NO_SLOT: u32 = u32::MAX;

#[derive(Debug, Default)]
struct Table {
    slots: HashMap<AccountId, u32, BuildHasherDefault<IdHasher>>,
    averages: Vec<Averages>,
    /// Each slot's recent TTFT samples ([`Cursor`] says why apart from `cursors`).
    samples: Vec<Samples>,
    cursors: Vec<Cursor>,
    /// Bumped whenever an account gets a slot, so cached slot lists know to refresh.
    epoch: u64,
}

impl Table {
    fn slot(&self, id: &AccountId) -> u32 {
        self.slots.get(id).copied().unwrap_or(NO_SLOT)
    }

    fn averages(&self, slot: u32) -> Option<&Averages> {
        self.averages.get(slot as usize)
    }

    fn averages_of(&self, id: &AccountId) -> Option<&Averages> {
        self.averages(*self.slots.get(id)?)
    }

    fn get(&self, id: &AccountId) -> Option<(&Averages, RecentTtft<'_>)> {
        let slot = *self.slots.get(id)? as usize;
        Some(self.at(slot))
    }

    fn at(&self, slot: usize) -> (&Averages, RecentTtft<'_>) {
        let recent = RecentTtft {
            samples: &self.samples[slot],
            cursor: self.cursors[slot],
        };
        (&self.averages[slot], recent)
    }

    fn get_or_insert(&mut self, id: &AccountId) -> (&mut Averages, RecentTtftMut<'_>) {
        let next = u32::try_from(self.averages.len()).unwrap_or(NO_SLOT);
        // Looked up first: the id is cloned (a count on an `Arc` every thread shares)
        // only for an account new to the table.
        let slot = match self.slots.get(id) {
            Some(&slot) => slot,
            None => *self.slots.entry(id.clone()).or_insert(next),
        };
        if slot == next {
            self.averages.push(Averages::default());
            self.samples.push(Samples::default());
            self.cursors.push(Cursor::default());
            self.epoch += 1;
        }
        let slot = slot as usize;
        let recent = RecentTtftMut {
            samples: &mut self.samples[slot],
            cursor: &mut self.cursors[slot],
        };
        (&mut self.averages[slot], recent)
    }
}

/// The rating slots of one snapshot's accounts, cached per thread: resolving them costs
/// one hash lookup per account, and the proxy plans many requests over the same cached
/// snapshot. The entry holds clones of the ids, so their allocations stay alive and
/// pointer equality with the snapshot's ids proves they are the same accounts.
#[derive(Debug)]
struct CachedSlots {
    engine: u64,
    epoch: u64,
    ids: Vec<AccountId>,
    slots: Vec<u32>,
}

impl CachedSlots {
    fn matches(&self, engine: u64, epoch: u64, snapshot: &[Candidate]) -> bool {
        self.engine == engine
            && self.epoch == epoch
            && self.ids.len() == snapshot.len()
            && self
                .ids
                .iter()
                .zip(snapshot)
                .all(|(a, c)| std::ptr::eq(a.as_str(), c.id.as_str()))
    }
}

/// How many snapshots each thread remembers (several groups share a worker thread).
const CACHED_SNAPSHOTS: usize = 4;

#[derive(Debug, Default)]
struct SlotCache {
    entries: Vec<CachedSlots>,
    next: usize,
}

impl SlotCache {
    fn slots(&mut self, engine: u64, table: &Table, snapshot: &[Candidate]) -> &[u32] {
        let epoch = table.epoch;
        let found = self
            .entries
            .iter()
            .position(|e| e.matches(engine, epoch, snapshot));
        let at = match found {
            Some(at) => at,
            None => {
                let fresh = CachedSlots {
                    engine,
                    epoch,
                    ids: snapshot.iter().map(|c| c.id.clone()).collect(),
                    slots: snapshot.iter().map(|c| table.slot(&c.id)).collect(),
                };
                if self.entries.len() < CACHED_SNAPSHOTS {
                    self.entries.push(fresh);
                    self.entries.len() - 1
                } else {
                    let at = self.next;
                    self.next = (self.next + 1) % CACHED_SNAPSHOTS;
                    self.entries[at] = fresh;
                    at
                }
            }
        };
        &self.entries[at].slots
    }
}

/// Gives every engine a distinct id for the slot cache (addresses can be reused).
static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(0);

/// Per-account metrics as read for one ranking (`NaN` = no fresh sample).
#[derive(Debug, Clone, Copy)]
struct Metrics {
    ttft: f64,
    total: f64,
    error: f64,
}

/// What ranking learnt about the group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GroupSummary {
    /// At least one ranked account had a fresh TTFT.
    pub has_ttft: bool,
    /// The group's median TTFT, when it filled the gap of an account without one.
    pub median_ttft: Option<f64>,
}

/// Buffers reused from plan to plan (per thread), so ranking does not allocate.
#[derive(Default)]
struct ScoreBuffers {
    metrics: Vec<Metrics>,
    values: Vec<u64>,
    scores: Vec<f64>,
    keys: Vec<u64>,
    old: Vec<usize>,
}

#[derive(Default)]
struct Scratch {
    cache: SlotCache,
    buffers: ScoreBuffers,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The key-rating engine, shared by every request (see the module docs for the rules).
#[derive(Debug)]
pub struct RatingEngine {
    id: u64,
    config: RatingConfig,
    table: RwLock<Table>,
}

impl Default for RatingEngine {
    fn default() -> Self {
        Self::with_valid_config(RatingConfig::default())
    }
}

impl RatingEngine {
    /// An engine with the default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// An engine with `config`, once [`RatingConfig::validate`] accepts it.
    pub fn try_new(config: RatingConfig) -> Result<Self, SelectError> {
        config.validate()?;
        Ok(Self::with_valid_config(config))
    }

    fn with_valid_config(config: RatingConfig) -> Self {
        Self {
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            config,
            table: RwLock::default(),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &RatingConfig {
        &self.config
    }

    fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the outcome of one attempt by `id`, taken at `now`.
    pub fn record(&self, id: &AccountId, sample: Sample, now: UnixMs) {
        let (alpha, max_age) = (self.config.ewma_alpha, self.config.max_sample_age_ms);
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        match sample {
            Sample::Success { ttft_ms, total_ms } => {
                let (avg, mut recent) = table.get_or_insert(id);
                avg.ttft.observe(ttft_ms as f64, now, alpha, max_age);
                avg.total.observe(total_ms as f64, now, alpha, max_age);
                avg.error.observe(0.0, now, alpha, max_age);
                recent.push(TtftSample {
                    at: now,
                    ttft_ms: u32::try_from(ttft_ms).unwrap_or(u32::MAX),
                });
            }
            Sample::Failure => table
                .get_or_insert(id)
                .0
                .error
                .observe(1.0, now, alpha, max_age),
            Sample::RequestError => {}
        }
    }

    /// The fresh averages of `id` at `now`.
    pub fn rating(&self, id: &AccountId, now: UnixMs) -> AccountRating {
        let max_age = self.config.max_sample_age_ms;
        self.read()
            .averages_of(id)
            .map(|s| AccountRating {
                ttft_ms: s.ttft.get(now, max_age),
                total_ms: s.total.get(now, max_age),
                error_rate: s.error.get(now, max_age),
            })
            .unwrap_or_default()
    }

    /// The nearest-rank p90 of `id`'s fresh recent TTFT samples.
    pub fn p90_ttft_ms(&self, id: &AccountId, now: UnixMs) -> Option<u64> {
        self.read()
            .get(id)
            .and_then(|(_, recent)| recent.p90(now, self.config.max_sample_age_ms))
    }

    /// The score of each of `candidates` at `now`, taking them as one group (for the
    /// admin page and tests; the planner uses the same computation).
    pub fn scores(&self, candidates: &[Candidate], now: UnixMs) -> Vec<f64> {
        let mut buffers = ScoreBuffers::default();
        let table = self.read();
        let averages = candidates.iter().map(|c| table.averages_of(&c.id));
        self.score_group(averages, now, &mut buffers);
        buffers.scores
    }

    /// Reads every account's averages (`None` = never sampled), fills the gaps with the
    /// group medians and writes one score per account into `buffers.scores`.
    fn score_group<'t>(
        &self,
        averages: impl Iterator<Item = Option<&'t Averages>>,
        now: UnixMs,
        buffers: &mut ScoreBuffers,
    ) -> GroupSummary {
        let max_age = self.config.max_sample_age_ms;
        let ScoreBuffers {
            metrics,
            values,
            scores,
            ..
        } = buffers;
        metrics.clear();
        scores.clear();
        metrics.extend(averages.map(|avg| match avg {
            Some(a) => Metrics {
                ttft: a.ttft.get(now, max_age).unwrap_or(f64::NAN),
                total: a.total.get(now, max_age).unwrap_or(f64::NAN),
                error: a.error.get(now, max_age).unwrap_or(0.0),
            },
            None => Metrics {
                ttft: f64::NAN,
                total: f64::NAN,
                error: 0.0,
            },
        }));
        let ttft_gaps = metrics.iter().filter(|m| m.ttft.is_nan()).count();
        if ttft_gaps == metrics.len() {
            // No TTFT anywhere in the group: all scores equal.
            scores.resize(metrics.len(), 0.0);
            return GroupSummary {
                has_ttft: false,
                median_ttft: None,
            };
        }
        // The medians are only needed when some account has a gap to fill.
        let median_ttft = if ttft_gaps > 0 {
            values.clear();
            values.extend(
                metrics
                    .iter()
                    .filter(|m| !m.ttft.is_nan())
                    .map(|m| m.ttft.to_bits()),
            );
            median(values)
        } else {
            None
        };
        let fill_ttft = median_ttft.unwrap_or(0.0);
        let fill_total = if metrics.iter().any(|m| m.total.is_nan()) {
            values.clear();
            values.extend(
                metrics
                    .iter()
                    .filter(|m| !m.total.is_nan())
                    .map(|m| m.total.to_bits()),
            );
            median(values).unwrap_or(0.0)
        } else {
            0.0
        };
        let w = self.config.weights;
        scores.extend(metrics.iter().map(|m| {
            let ttft = if m.ttft.is_nan() { fill_ttft } else { m.ttft };
            let total = if m.total.is_nan() {
                fill_total
            } else {
                m.total
            };
            // `+ 0.0` turns a -0.0 into 0.0 so that the bit order below is numeric.
            w.score(ttft, total, m.error) + 0.0
        }));
        GroupSummary {
            has_ttft: true,
            median_ttft,
        }
    }

    /// Reorders `indices` (snapshot indices, in snapshot order) by ascending score,
    /// stable: equal scores keep their order.
    pub(crate) fn rank(
        &self,
        snapshot: &[Candidate],
        indices: &mut [usize],
        now: UnixMs,
    ) -> GroupSummary {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let Scratch { cache, buffers } = &mut *scratch;
            let summary = {
                let table = self.read();
                let slots = cache.slots(self.id, &table, snapshot);
                let averages = indices.iter().map(|&i| table.averages(slots[i]));
                self.score_group(averages, now, buffers)
            };
            if !summary.has_ttft {
                return summary;
            }
            sort_by_score(
                indices,
                &buffers.scores,
                &mut buffers.keys,
                &mut buffers.old,
            );
            summary
        })
    }

    /// The fresh state of `id`, for mirroring after a sample.
    pub fn export_account(&self, id: &AccountId, now: UnixMs) -> Option<AccountRatingState> {
        let table = self.read();
        let (avg, recent) = table.get(id)?;
        self.export_stats(id, avg, recent, now)
    }

    fn export_stats(
        &self,
        id: &AccountId,
        s: &Averages,
        recent: RecentTtft<'_>,
        now: UnixMs,
    ) -> Option<AccountRatingState> {
        let max_age = self.config.max_sample_age_ms;
        let state = AccountRatingState {
            id: id.clone(),
            ttft: s.ttft.export(now, max_age),
            total: s.total.export(now, max_age),
            error: s.error.export(now, max_age),
            recent_ttft: recent
                .iter()
                .filter(|t| now.saturating_sub(t.at) <= max_age)
                .collect(),
        };
        let empty = state.ttft.is_none()
            && state.total.is_none()
            && state.error.is_none()
            && state.recent_ttft.is_empty();
        (!empty).then_some(state)
    }

    /// The fresh state of every account.
    pub fn export(&self, now: UnixMs) -> RatingState {
        let table = self.read();
        let mut accounts: Vec<AccountRatingState> = table
            .slots
            .iter()
            .filter_map(|(id, &slot)| {
                let (avg, recent) = table.at(slot as usize);
                self.export_stats(id, avg, recent, now)
            })
            .collect();
        accounts.sort_by(|a, b| a.id.cmp(&b.id));
        RatingState { accounts }
    }

    /// Merges `state` in: per average, the newer one wins; the recent TTFT ring is
    /// replaced when the imported one has a newer sample. Non-finite or negative values
    /// are ignored.
    pub fn import(&self, state: &RatingState) {
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        for account in &state.accounts {
            let (avg, mut recent_ttft) = table.get_or_insert(&account.id);
            avg.ttft.merge(account.ttft);
            avg.total.merge(account.total);
            avg.error.merge(account.error);
            let imported_newest = account.recent_ttft.iter().map(|s| s.at).max();
            if imported_newest > recent_ttft.as_ref().newest_at() {
                recent_ttft.replace(&account.recent_ttft);
            }
        }
    }
}

/// Reorders `indices` by ascending `scores` (one per index, same order), stable.
///
/// Scores are finite and `>= 0`, so their bit patterns order like the numbers. Each key
/// is the score's bits with the low bits replaced by the position, sorted as a `u64`;
/// cutting those low bits can only merge scores that differ in their last mantissa bits,
/// and a final insertion pass over the (nearly sorted) keys restores the exact order.
fn sort_by_score(indices: &mut [usize], scores: &[f64], keys: &mut Vec<u64>, old: &mut Vec<usize>) {
    let n = indices.len();
    let position_bits = usize::BITS - n.saturating_sub(1).leading_zeros();
    let mask = (1u64 << position_bits) - 1;
    let exact = |key: u64| (scores[(key & mask) as usize].to_bits(), key & mask);
    keys.clear();
    keys.extend(
        scores
            .iter()
            .enumerate()
            .map(|(position, s)| (s.to_bits() & !mask) | position as u64),
    );
    keys.sort_unstable();
    for i in 1..n {
        let mut j = i;
        while j > 0 && exact(keys[j]) < exact(keys[j - 1]) {
            keys.swap(j, j - 1);
            j -= 1;
        }
    }
    old.clear();
    old.extend_from_slice(indices);
    for (index, key) in indices.iter_mut().zip(keys.iter()) {
        *index = old[(key & mask) as usize];
    }
}

/// The median of `values` (reordered); the mean of the two middle values for an even
/// count; `None` when empty.
///
/// The values are latencies (finite, `>= 0`), handled as their bit patterns, which
/// order like the numbers and compare faster than floats.
fn median(values: &mut [u64]) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let (lower, upper, _) = values.select_nth_unstable(n / 2);
    let upper = f64::from_bits(*upper);
    if n % 2 == 1 {
        return Some(upper);
    }
    let below = lower.iter().copied().max().map_or(upper, f64::from_bits);
    Some((below + upper) / 2.0)
}

#[cfg(test)]
mod tests {
    use keypool_core::{AuthType, Provider};

    use super::*;

    fn id(s: &str) -> AccountId {
        AccountId::from(s)
    }

    fn ok(ttft_ms: u64, total_ms: u64) -> Sample {
        Sample::Success { ttft_ms, total_ms }
    }

    proptest::proptest! {
        /// The u64-key sort with its insertion fix-up equals a plain stable sort by
        /// exact score, also for scores that differ only in their last mantissa bits.
        #[test]
        fn sort_by_score_is_a_stable_sort_by_exact_score(
            ulps in proptest::collection::vec(0u64..4_000, 0..300),
            base in proptest::prop_oneof![proptest::strategy::Just(0.0f64), 1.0f64..1e6],
            stride in 1usize..4,
        ) {
            let scores: Vec<f64> = ulps.iter().map(|&u| f64::from_bits(base.to_bits() + u)).collect();
            let mut indices: Vec<usize> = (0..scores.len()).map(|i| i * stride).collect();
            let mut expected: Vec<(f64, usize)> = scores.iter().copied().zip(indices.iter().copied()).collect();
            expected.sort_by(|a, b| a.0.total_cmp(&b.0));
            sort_by_score(&mut indices, &scores, &mut Vec::new(), &mut Vec::new());
            let expected: Vec<usize> = expected.into_iter().map(|e| e.1).collect();
            proptest::prop_assert_eq!(indices, expected);
        }

        /// The ring of recent TTFTs (its samples and its cursor apart) holds the newest
        /// RECENT_TTFT_SAMPLES samples pushed, oldest first, however many wrapped it;
        /// replacing it with a list keeps that list's newest ones.
        #[test]
        fn the_recent_ring_keeps_the_newest_samples_in_order(
            ttfts in proptest::collection::vec(0u32..100_000, 0..60),
            replaced in proptest::collection::vec(0u32..100_000, 0..40),
        ) {
            let sample = |(i, &ttft_ms): (usize, &u32)| TtftSample { at: i as u64, ttft_ms };
            let newest = |all: &[TtftSample]| all[all.len().saturating_sub(RECENT_TTFT_SAMPLES)..].to_vec();
            let pushed: Vec<TtftSample> = ttfts.iter().enumerate().map(sample).collect();
            let (mut samples, mut cursor) = (Samples::default(), Cursor::default());
            let mut ring = RecentTtftMut { samples: &mut samples, cursor: &mut cursor };
            for &s in &pushed {
                ring.push(s);
            }
            proptest::prop_assert_eq!(ring.as_ref().iter().collect::<Vec<_>>(), newest(&pushed));
            proptest::prop_assert_eq!(ring.as_ref().newest_at(), pushed.last().map(|s| s.at));
            let list: Vec<TtftSample> = replaced.iter().enumerate().map(sample).collect();
            ring.replace(&list);
            proptest::prop_assert_eq!(ring.as_ref().iter().collect::<Vec<_>>(), newest(&list));
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        let bits = |v: &[f64]| median(&mut v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        assert_eq!(bits(&[]), None);
        assert_eq!(bits(&[5.0]), Some(5.0));
        assert_eq!(bits(&[9.0, 1.0, 5.0]), Some(5.0));
        assert_eq!(bits(&[9.0, 1.0, 5.0, 3.0]), Some(4.0));
        assert_eq!(bits(&[0.0, 1e6]), Some(5e5));
    }

    #[test]
    fn ewma_blends_with_alpha_and_restarts_after_ten_minutes() {
        let e = RatingEngine::new();
        let a = id("a");
        e.record(&a, ok(100, 1000), 0);
        assert_eq!(e.rating(&a, 0).ttft_ms, Some(100.0));
        e.record(&a, ok(500, 1000), 1_000);
        // 0.25·500 + 0.75·100
        assert_eq!(e.rating(&a, 1_000).ttft_ms, Some(200.0));
        // Exactly 10 minutes after the newest sample it still counts; 1 ms later not.
        assert_eq!(e.rating(&a, 601_000).ttft_ms, Some(200.0));
        assert_eq!(e.rating(&a, 601_001), AccountRating::default());
        // The next sample starts afresh.
        e.record(&a, ok(40, 80), 601_001);
        assert_eq!(e.rating(&a, 601_001).ttft_ms, Some(40.0));
        assert_eq!(e.rating(&a, 601_001).total_ms, Some(80.0));
    }

    #[test]
    fn request_errors_are_not_errors_and_failures_are() {
        let e = RatingEngine::new();
        let a = id("a");
        e.record(&a, Sample::RequestError, 0);
        assert_eq!(e.rating(&a, 0), AccountRating::default());
        e.record(&a, Sample::Failure, 0);
        let r = e.rating(&a, 0);
        assert_eq!(r.error_rate, Some(1.0));
        assert_eq!(r.ttft_ms, None);
        e.record(&a, ok(10, 10), 1);
        assert_eq!(e.rating(&a, 1).error_rate, Some(0.75));
    }

    #[test]
    fn scores_use_the_formula_and_the_group_median() {
        let e = RatingEngine::new();
        let c = |s: &str| Candidate::new(s, Provider::Anthropic, AuthType::ApiKey);
        let pool = [c("a"), c("b"), c("c"), c("new")];
        e.record(&pool[0].id, ok(100, 1000), 0);
        e.record(&pool[1].id, ok(300, 2000), 0);
        e.record(&pool[2].id, ok(200, 4000), 0);
        e.record(&pool[2].id, Sample::Failure, 0);
        let s = e.scores(&pool, 0);
        assert_eq!(s[0], 100.0 + 100.0);
        assert_eq!(s[1], 300.0 + 200.0);
        // error rate 0.25 after one failure on top of a success.
        assert_eq!(s[2], 200.0 + 400.0 + 2_500.0);
        // no sample: median TTFT 200, median total 2000, no errors.
        assert_eq!(s[3], 200.0 + 200.0);
    }

    #[test]
    fn no_ttft_in_the_group_makes_every_score_equal() {
        let e = RatingEngine::new();
        let c = |s: &str| Candidate::new(s, Provider::Anthropic, AuthType::ApiKey);
        let pool = [c("a"), c("b")];
        e.record(&pool[1].id, Sample::Failure, 0);
        assert_eq!(e.scores(&pool, 0), vec![0.0, 0.0]);
    }

    #[test]
    fn p90_uses_the_fresh_recent_samples() {
        let e = RatingEngine::new();
        let a = id("a");
        assert_eq!(e.p90_ttft_ms(&a, 0), None);
        for (i, ttft) in (1..=10u64).enumerate() {
            e.record(&a, ok(ttft * 100, 0), i as u64);
        }
        // ceil(0.9·10) = 9th smallest.
        assert_eq!(e.p90_ttft_ms(&a, 10), Some(900));
        // The ring keeps the last 16 samples only.
        for i in 0..16 {
            e.record(&a, ok(50, 0), 100 + i);
        }
        assert_eq!(e.p90_ttft_ms(&a, 200), Some(50));
        assert_eq!(
            e.p90_ttft_ms(&a, 100 + 15 + DEFAULT_MAX_SAMPLE_AGE_MS + 1),
            None
        );
    }

    #[test]
    fn export_import_round_trips_through_json_and_newer_wins() {
        let e = RatingEngine::new();
        let (a, b) = (id("a"), id("b"));
        e.record(&a, ok(120, 900), 1_000);
        e.record(&b, Sample::Failure, 1_000);
        let state = e.export(2_000);
        let json = serde_json::to_string(&state).unwrap();
        let back: RatingState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);

        let other = RatingEngine::new();
        other.record(&a, ok(999, 999), 5_000);
        other.import(&back);
        // Local is newer for `a`: kept.
        assert_eq!(other.rating(&a, 5_000).ttft_ms, Some(999.0));
        assert_eq!(other.rating(&b, 5_000).error_rate, Some(1.0));

        let fresh = RatingEngine::new();
        fresh.import(&back);
        assert_eq!(fresh.rating(&a, 2_000), e.rating(&a, 2_000));
        assert_eq!(fresh.p90_ttft_ms(&a, 2_000), Some(120));
        assert_eq!(fresh.export_account(&a, 2_000), e.export_account(&a, 2_000));
        // Stale accounts are not exported.
        assert_eq!(
            e.export(1_000 + DEFAULT_MAX_SAMPLE_AGE_MS + 1),
            RatingState::default()
        );
    }

    #[test]
    fn import_ignores_insane_values() {
        let e = RatingEngine::new();
        let a = id("a");
        let state = RatingState {
            accounts: vec![AccountRatingState {
                id: a.clone(),
                ttft: Some(EwmaState {
                    value: f64::NAN,
                    updated_at: 1,
                }),
                total: Some(EwmaState {
                    value: -5.0,
                    updated_at: 1,
                }),
                error: Some(EwmaState {
                    value: f64::INFINITY,
                    updated_at: 1,
                }),
                recent_ttft: vec![],
            }],
        };
        e.import(&state);
        assert_eq!(e.rating(&a, 1), AccountRating::default());
        let negative_zero = RatingState {
            accounts: vec![AccountRatingState {
                id: a.clone(),
                ttft: Some(EwmaState {
                    value: -0.0,
                    updated_at: 1,
                }),
                total: None,
                error: None,
                recent_ttft: vec![],
            }],
        };
        e.import(&negative_zero);
        let ttft = e.rating(&a, 1).ttft_ms.unwrap();
        assert!(ttft == 0.0 && ttft.is_sign_positive());
    }

    #[test]
    fn invalid_configs_are_refused() {
        let mut cfg = RatingConfig::default();
        cfg.weights.error = -1.0;
        assert!(matches!(
            RatingEngine::try_new(cfg),
            Err(SelectError::InvalidRatingConfig("the error weight"))
        ));
        let cfg = RatingConfig {
            ewma_alpha: 0.0,
            ..RatingConfig::default()
        };
        assert!(RatingEngine::try_new(cfg).is_err());
        let cfg = RatingConfig {
            weights: RatingWeights {
                ttft: f64::INFINITY,
                ..RatingWeights::default()
            },
            ..RatingConfig::default()
        };
        assert!(RatingEngine::try_new(cfg).is_err());
        assert!(RatingEngine::try_new(RatingConfig::default()).is_ok());
    }
}
