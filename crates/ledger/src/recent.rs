//! [`RecentRecords`]: the most recent usage records, newest first, for request lookup
//! (SPEC 11, `GET /admin/requests`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use crate::packed::Packed;
use crate::record::UsageRecord;

/// What `GET /admin/requests` filters by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordFilter {
    /// Only this caller's (key id).
    pub caller: Option<String>,
    /// Only these statuses.
    pub status: Option<StatusFilter>,
}

/// A status, or a class of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// Exactly this status.
    Exact(u16),
    /// `2xx`, `4xx`, `5xx`: the hundred.
    Class(u16),
    /// Any error (4xx, 5xx, or no answer).
    Error,
}

impl StatusFilter {
    /// `429`, `4xx`, or `error`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "error" | "errors" => Some(Self::Error),
            _ if text.len() == 3 && text.ends_with("xx") => text[..1]
                .parse::<u16>()
                .ok()
                .filter(|c| (1..=5).contains(c))
                .map(Self::Class),
            _ => text
                .parse::<u16>()
                .ok()
                .filter(|s| (100..=999).contains(s))
                .map(Self::Exact),
        }
    }

    fn admits(self, record: &UsageRecord) -> bool {
        match self {
            Self::Exact(s) => record.status == s,
            Self::Class(c) => record.status / 100 == c,
            Self::Error => record.is_error(),
        }
    }
}

impl RecordFilter {
    /// Whether `record` passes.
    pub fn admits(&self, record: &UsageRecord) -> bool {
        self.caller
            .as_deref()
            .is_none_or(|c| &*record.caller.id == c)
            && self.status.is_none_or(|s| s.admits(record))
    }
}

/// The last `capacity` records, each packed (the private `packed` module) into one small
/// allocation (what keeps thousands of them cheap on the request path).
#[derive(Debug)]
pub struct RecentRecords {
    capacity: usize,
    records: Mutex<VecDeque<Packed>>,
}

impl RecentRecords {
    /// Keeps at most `capacity` records (the oldest go first).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            records: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
        }
    }

    /// Adds a record (packed before the lock is taken). Once the ring is full, the
    /// oldest record's allocation takes the new one's bytes: no allocation, and no free
    /// of memory another thread allocated, per request.
    pub fn push(&self, record: &UsageRecord) {
        if self.capacity == 0 {
            return;
        }
        Packed::packing(record, |bytes| {
            let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
            // The capacity never changes, so at most one record is ever over it.
            if records.len() >= self.capacity
                && let Some(mut oldest) = records.pop_front()
            {
                oldest.refill(bytes);
                records.push_back(oldest);
                return;
            }
            records.push_back(Packed::from_bytes(bytes));
        });
    }

    /// The newest `limit` records that pass `filter`, newest first.
    pub fn list(&self, filter: &RecordFilter, limit: usize) -> Vec<Arc<UsageRecord>> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records
            .iter()
            .rev()
            .filter_map(Packed::unpack)
            .filter(|r| filter.admits(r))
            .take(limit)
            .map(Arc::new)
            .collect()
    }

    /// The record of request `id`, if it is still kept.
    pub fn get(&self, id: &str) -> Option<Arc<UsageRecord>> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records
            .iter()
            .rev()
            .find(|r| r.request_id() == Some(id))
            .and_then(Packed::unpack)
            .map(Arc::new)
    }

    /// Every record, oldest first (for the state file).
    pub fn export(&self) -> Vec<Arc<UsageRecord>> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records
            .iter()
            .filter_map(Packed::unpack)
            .map(Arc::new)
            .collect()
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::tests::record;
    use proptest::prelude::*;

    proptest! {
        /// The ring keeps the last `capacity` records, whatever their sizes (a full
        /// ring writes each over the oldest): exported oldest first, listed newest
        /// first, and a kept one found by its id.
        #[test]
        fn the_ring_keeps_the_last_records(
            records in proptest::collection::vec(record(), 0..24),
            capacity in 0..8usize,
        ) {
            let ring = RecentRecords::new(capacity);
            for r in &records {
                ring.push(r);
            }
            let kept = &records[records.len() - records.len().min(capacity)..];
            let exported: Vec<UsageRecord> =
                ring.export().iter().map(|r| (**r).clone()).collect();
            prop_assert_eq!(&exported[..], kept);
            prop_assert_eq!(ring.len(), kept.len());
            let listed: Vec<UsageRecord> = ring
                .list(&RecordFilter::default(), usize::MAX)
                .iter()
                .map(|r| (**r).clone())
                .collect();
            let newest_first: Vec<UsageRecord> = kept.iter().rev().cloned().collect();
            prop_assert_eq!(listed, newest_first);
            if let Some(last) = kept.last() {
                let found = ring.get(&last.request_id).map(|r| (*r).clone());
                let first_with_id = kept.iter().rev().find(|r| r.request_id == last.request_id);
                prop_assert_eq!(found.as_ref(), first_with_id);
            }
        }
    }
}
