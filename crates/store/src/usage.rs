//! The usage ledger in the store (SPEC 11): every authenticated request's record is
//! added to the day and month totals, kept among the recent records, counted in the
//! minute history; the state file keeps the totals and the recent records across a
//! restart, and with Redis every replica adds to the same totals (one script per
//! batch, exactly once) and can find any replica's requests.
//!
//! With Redis the additions wait in the aggregates' deltas until a batch is taken;
//! a batch that Redis did not acknowledge is sent again with the same number (Redis
//! adds a batch only once), so an outage loses no count and a lost answer doubles none.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use keypool_core::UnixMs;
use keypool_ledger::{
    AggregateKey, Aggregates, Dimension, Minute, MinuteHistory, Period, RecentRecords,
    RecordFilter, Totals, UsageRecord,
};

use crate::Store;
use crate::state::redis::RedisMirror;

/// Records waiting to be written to Redis at most (older ones are dropped first and
/// counted; their totals are in the deltas, which are never dropped).
const RECORD_OUTBOX: usize = 10_000;

/// The usage ledger's books.
#[derive(Debug)]
pub struct UsageBook {
    /// Totals per day and month by caller, account and model: this process's own
    /// additions (and, from a state file, what it had before a restart).
    pub aggregates: Aggregates,
    /// The most recent records.
    pub recent: RecentRecords,
    /// Requests, errors and tokens per minute over the last hour, in this process.
    pub history: MinuteHistory,
    outbox: Mutex<Outbox>,
}

#[derive(Debug, Default)]
struct Outbox {
    /// A batch of deltas sent but not acknowledged: sent again, with the same number.
    batch: Option<(u64, HashMap<AggregateKey, Totals>)>,
    next_seq: u64,
    records: VecDeque<Arc<UsageRecord>>,
    records_dropped: u64,
}

impl UsageBook {
    /// Empty books keeping `recent` records; `shared` keeps the deltas for Redis.
    pub(crate) fn new(recent: usize, shared: bool) -> Self {
        Self {
            aggregates: Aggregates::new(shared),
            recent: RecentRecords::new(recent),
            history: MinuteHistory::new(),
            // Batch numbers are per process (Redis dedupes them with the replica's
            // random origin), so they start at 0.
            outbox: Mutex::new(Outbox::default()),
        }
    }

    fn outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where a usage answer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageSource {
    /// Redis: every replica's totals (and this replica's additions not sent yet).
    Shared,
    /// This process's memory: with Redis configured but unreachable, only this
    /// replica's share.
    Local,
}

impl UsageSource {
    /// `redis` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "redis",
            Self::Local => "memory",
        }
    }
}

/// The rows of one period and dimension.
#[derive(Debug, Clone)]
pub struct UsageRows {
    /// `(org, key, totals)`, sorted by org and key.
    pub rows: Vec<(Arc<str>, Arc<str>, Totals)>,
    /// Where they come from.
    pub source: UsageSource,
}

impl Store {
    /// The usage books.
    pub fn usage(&self) -> &UsageBook {
        &self.runtime().usage
    }

    /// Adds one authenticated request's record to the ledger (the request path calls
    /// this once per request, when its answer ended).
    pub fn record_usage(&self, record: UsageRecord) {
        let book = self.usage();
        book.history.record(
            record.at.saturating_add(record.total_ms),
            record.is_error(),
            record.usage.total(),
        );
        book.recent.push(&record);
        book.aggregates.record(&record);
        if self.redis().is_some() {
            let record = Arc::new(record);
            let mut outbox = book.outbox();
            if outbox.records.len() >= RECORD_OUTBOX {
                outbox.records.pop_front();
                outbox.records_dropped += 1;
            }
            outbox.records.push_back(record);
        }
    }

    /// The totals of `period` by `dimension`: from Redis (every replica) when it
    /// answers, else this process's own.
    pub async fn usage_rows(&self, period: Period, dimension: Dimension) -> UsageRows {
        let book = self.usage();
        if let Some(mirror) = self.redis().filter(|m| m.ready())
            && let Ok(shared) = mirror.usage_rows(period, dimension).await
        {
            let mut rows = shared;
            // This replica's additions Redis has not taken yet.
            let outbox = book.outbox();
            let pending = outbox.batch.iter().flat_map(|(_, d)| d.iter());
            for (key, totals) in pending {
                if key.period == period && key.dimension == dimension {
                    rows.entry((key.org.clone(), key.key.clone()))
                        .or_default()
                        .add(totals);
                }
            }
            drop(outbox);
            for (key, totals) in book.aggregates.peek_deltas(period, dimension) {
                rows.entry((key.org, key.key)).or_default().add(&totals);
            }
            let mut rows: Vec<_> = rows.into_iter().map(|((o, k), t)| (o, k, t)).collect();
            rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
            return UsageRows {
                rows,
                source: UsageSource::Shared,
            };
        }
        UsageRows {
            rows: book.aggregates.rows(period, dimension),
            source: UsageSource::Local,
        }
    }

    /// The newest `limit` records passing `filter`: every replica's with Redis, else
    /// this process's.
    pub async fn recent_requests(
        &self,
        filter: &RecordFilter,
        limit: usize,
    ) -> (Vec<Arc<UsageRecord>>, UsageSource) {
        if let Some(mirror) = self.redis().filter(|m| m.ready()) {
            let keep = self.config().usage().recent_requests;
            // This replica's records not written yet come first (they are the newest).
            let mut records: Vec<Arc<UsageRecord>> = self
                .usage()
                .outbox()
                .records
                .iter()
                .rev()
                .filter(|r| filter.admits(r))
                .cloned()
                .collect();
            if let Ok(shared) = mirror.recent_records(keep).await {
                records.extend(
                    shared
                        .into_iter()
                        .filter(|r| filter.admits(r))
                        .map(Arc::new),
                );
                records.truncate(limit);
                return (records, UsageSource::Shared);
            }
        }
        (self.usage().recent.list(filter, limit), UsageSource::Local)
    }

    /// The record of request `id`: this process's, else any replica's through Redis.
    pub async fn request_record(&self, id: &str) -> Option<Arc<UsageRecord>> {
        if let Some(record) = self.usage().recent.get(id) {
            return Some(record);
        }
        let mirror = self.redis().filter(|m| m.ready())?;
        mirror.record(id).await.ok().flatten().map(Arc::new)
    }

    /// Requests, errors and tokens per minute over the hour up to `now` (this process).
    pub fn usage_history(&self, now: UnixMs) -> Vec<Minute> {
        self.usage().history.series(now)
    }

    /// Sends what Redis has not taken yet: the unacknowledged batch again, else the
    /// deltas since the last batch as a new one; then the records.
    pub(crate) async fn flush_usage(&self, mirror: &RedisMirror) {
        let book = self.usage();
        let retention = self.config().usage().retention_days;
        let (seq, deltas) = {
            let mut outbox = book.outbox();
            if outbox.batch.is_none() {
                let deltas = book.aggregates.take_deltas();
                if !deltas.is_empty() {
                    let seq = outbox.next_seq;
                    outbox.next_seq = outbox.next_seq.wrapping_add(1);
                    outbox.batch = Some((seq, deltas));
                }
            }
            match &outbox.batch {
                Some((seq, deltas)) => (*seq, deltas.clone()),
                None => (0, HashMap::new()),
            }
        };
        if !deltas.is_empty() {
            match mirror.add_usage(seq, &deltas, retention).await {
                Ok(()) => book.outbox().batch = None,
                Err(e) => {
                    tracing::debug!(error = %e, "usage totals kept for the next flush");
                    return;
                }
            }
        }
        let records: Vec<Arc<UsageRecord>> = book.outbox().records.drain(..).collect();
        if let Err(e) = mirror
            .push_records(&records, self.config().usage().recent_requests)
            .await
        {
            tracing::debug!(error = %e, "usage records kept for the next flush");
            let mut outbox = book.outbox();
            for record in records.into_iter().rev() {
                outbox.records.push_front(record);
            }
            while outbox.records.len() > RECORD_OUTBOX {
                outbox.records.pop_front();
                outbox.records_dropped += 1;
            }
        }
    }

    /// Usage additions and records this replica has not written to Redis yet.
    pub fn usage_unflushed(&self) -> (usize, usize) {
        let book = self.usage();
        let outbox = book.outbox();
        (
            book.aggregates.pending() + outbox.batch.as_ref().map_or(0, |(_, d)| d.len()),
            outbox.records.len(),
        )
    }
}
